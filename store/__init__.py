"""The on-disk format: tables of chunked Zarr columns, commit log, stream/step index."""
