"""Export/import formats: Parquet, Minari (Arrow and HDF5 backends) and D4RL-style HDF5.

The front doors are :func:`replaystore.tools.export.export_store` and
:func:`replaystore.tools.importer.import_store`; see docs/EXPORT.md.
"""
