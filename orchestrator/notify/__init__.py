"""Webhooks: deliveries of runs' and steps' ends to the URLs admins registered, signed
(``signing``) and sent, retried with backoff, by a thread of each scheduler process
(``deliverer``). The deliveries themselves are written by the statements that end a run or
record a step (``db.run_statements``), so none is lost or made twice."""
