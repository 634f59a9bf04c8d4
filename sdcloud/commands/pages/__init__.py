"""The commands that show a job as a page: `report` (a file) and `dashboard` (served, live)."""
