"""The stateless iPXE renderer (seed 003): scripts rendered per request from
node state. Layout, one job per module:

- ``service``: the service frame (HTTP, gRPC, optional cache);
- ``handlers`` / ``grpc_service``: the HTTP routes and ``BootScriptRenderer``;
- ``render``: boot data → script, never an exception; ``plan``: what to boot;
- ``safety``: validation/escaping of every interpolated value;
- ``reader``: the one-method ``BootDataReader`` Protocol, cache, static reader;
- ``address``: addresses recorded in the state dir for ephemeral ports;
- ``interpret``: what iPXE would do with a script (the simulator hook).
"""
