"""``plugmq console``: a web console for one broker or a cluster, through the admin endpoint only.

Pages: the cluster and its brokers (roles, epochs, replication lag), topics (queues, offsets,
sampled rates), consumer groups (lag per queue over time from a small in-memory history the
console samples, in-flight messages, connected clients, offset reset), message lookup by id, key
or time with a body preview, a message's trace, and a group's dead letters with browse, select
and re-drive. Sign-in with an admin account of the brokers' ACL; the console signs every admin
call with it. It listens on loopback by default. A Starlette application rendered on the server
with Jinja2 and served by uvicorn (the ``console`` extra); ``plugmq serve`` never imports it.
"""
