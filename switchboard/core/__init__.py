"""The kernel every app may use: errors, tokens and hashing, counters, rate limits, the verb
registry, CLI and page helpers. It imports no app."""
