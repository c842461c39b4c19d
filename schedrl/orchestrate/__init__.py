"""The training loops: the synchronous loop, the asynchronous pipeline and its policies, the staleness bound."""
