"""scaler: an event-sourced autoscaler for serverless functions, installed as this one import package.

Its parts, lowest first (a part imports only from those before it; tests/project/test_packages.py):
`proto` (the wire and the events), `runtime` (what every process shares), `controller.core` (pure
state, decisions and policies), the services `controller`, `gateway` and `workers`, and the tools
`platform_stub`, `simulator`, `report` and `cli` (the `scaler` command).
"""

import os

# gRPC's C core logs on its own (a failed bind: "E1122 ... add_port.cc ...", repeating what our parts say in
# their own words): off unless GRPC_VERBOSITY asks for it. Here, before any part imports grpc.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
