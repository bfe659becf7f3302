"""The processes `hongbao serve` runs: the embedded Valkey child, the uvicorn workers, and
the settings an operator command takes from a data folder."""
