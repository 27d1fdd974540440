"""The command path: what a command goes through in the node, from its call to its answer.

In the order a call takes it:
- door.py: where a command comes in; routed to its partition's owner (forwarded when that is another
  node), refused at once by admission.py when the node is behind, else handed to its function's lane;
- lanes.py: each function's queue, taken a group at a time (group commit), and the function's plan
  decided once the group's callers are answered;
- lane.py: the group decided in order by the pure core (scaler/controller/core, on the state the
  ledger folds: scaler/controller/ledger.py), appended as one batch, and what that committed returned;
- writer.py: the append, with the function's order check, over the event store (scaler/store);
- replies.py: the answers out, to a caller in this process or over NATS;
- timers.py: each function's next deadline, fired back into its lane as a Tick.

Around the path, in the controller: the partitions this node serves and their leases, recovery as they
come and go, and snapshots (scaler/controller/shell.py puts it all together).
"""
