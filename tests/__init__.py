"""The virtualpar test suite (a package, so that device processes started with "spawn" or
"forkserver" can import helper modules such as ``tests._device_fns`` by name)."""
