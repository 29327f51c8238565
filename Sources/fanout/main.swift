print("fanout")
