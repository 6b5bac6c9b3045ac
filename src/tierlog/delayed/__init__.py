"""Delayed delivery: messages published with ``x-delay`` / ``x-deliver-at`` to a stream
created with ``x-tierlog-delayed=true`` are kept in the stream's hidden system stream and
appended to the stream when due, exactly once (docs/delayed.md).

Layer 5: ``records`` (byte layouts of system records, working-set bodies, timer objects),
``properties`` (the delay properties of an AMQP message), ``state`` (the scheduler's pure
decisions), ``timers`` (timer objects and the fenced timer manifest), ``clock`` (wall clock
and the reference it is checked against), ``port`` (what the scheduler needs of its
streams), ``scheduler`` (the I/O shell). The server wires it to streams
(``server/delayed_service.py``, ``server/delayed_intake.py``).
"""
