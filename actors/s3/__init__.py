"""The S3 client of recording-finalize: outcomes and their classification
(``objectstore``), the worker process that makes the HEADs with libcurl (``worker``), its
JSON-lines wire format (``wire``), its credentials (``credentials``), its metrics
(``metrics``) and the daemon-side handle that drives it (``process``)."""
