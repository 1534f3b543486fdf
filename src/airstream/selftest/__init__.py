"""Self-tests behind ``airstream selftest``: the stream-program fuzzer and the OpInfo sweep."""
