"""What a run or batch job has made, as the user sees it: the run page (`sdcloud report`) and the
pieces the live dashboard (sdcloud/dashboard/) serves from the same data.

page.py builds the page's data (the JSON format: everything the HTML shows), html.py renders it,
charts.py draws the time series as SVG, sources.py reads samples, metrics and images from the run's
store, secrets.py keeps every known secret out of what is shown.
"""
