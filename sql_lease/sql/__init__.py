"""The SQL provider: table definition (schema), per-dialect statements, and the executor (provider)."""
