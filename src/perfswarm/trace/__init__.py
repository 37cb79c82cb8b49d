"""The Run store, its Arrow schemas and one reader per raw format."""
