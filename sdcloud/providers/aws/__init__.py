"""AWS: EC2 compute (compute.py), the price-list and spot-price catalog refresh (catalog.py), shared session helpers (session.py)."""
