"""What runs cost: prices over an attempt's own hours (and, as it grows, the ledger and the reports)."""
