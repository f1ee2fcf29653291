print("hello from the agent workspace")
