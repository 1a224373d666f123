"""One run: its driver actor (:mod:`.driver`), its worker actors (:mod:`.worker`), the
Ray-free round loop they drive (:mod:`.round_loop`, :mod:`.round_callbacks`), the server-side
evaluation, checkpoints, and the assignment of clients to workers (:mod:`.placement`)."""
