"""Serving: launcher back-ends (local processes, containers), device slots, platforms, the
version fingerprint and the OpenAI client that sends the workload. The I/O edge towards servers."""
