print("mock-apns")
