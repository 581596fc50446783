"""HTTP routes of the gateway, one module per resource; each route only decodes and delegates."""
