"""The three phases (snapshot, log-store catch-up, forward) and the range of epochs each commit applies."""
