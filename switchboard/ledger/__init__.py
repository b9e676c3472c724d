"""The hash-chained ledger: append, verify, rows. It depends on no other app."""
