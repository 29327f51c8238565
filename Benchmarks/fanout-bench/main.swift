print("fanout-bench: no scenario exists yet")
