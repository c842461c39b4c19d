"""The training loops: synchronous on-policy now; staleness control and weight-sync policies next."""
