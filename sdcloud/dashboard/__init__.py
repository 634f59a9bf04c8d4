"""`sdcloud dashboard`: this home's runs and batch jobs (and those of `--store` buckets) as live pages.

access.py decides where it may listen and who may ask; sources.py finds the jobs (this home's state
store, each bucket's journals); app.py is the ASGI app (starlette), serve.py runs it (uvicorn).
The pages are the run page of sdcloud/views/, refreshed in place by a small inline script.
"""
