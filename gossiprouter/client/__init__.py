"""The client package: :class:`RouterStub` and what it is made of.

Read top-down:

* :mod:`~gossiprouter.client.errors` and :mod:`~gossiprouter.client.model`: the exceptions
  and the values applications see (Member, Message, Publication, events, statuses);
* :mod:`~gossiprouter.client.streams`: bounded streams (EventStream, Watch);
* :mod:`~gossiprouter.client.channel`: one logical address in one group (Channel);
* :mod:`~gossiprouter.client.connection`: one router's I/O (Connection: one live TCP
  connection; RouterSlot: what the stub keeps about a router across reconnects);
* :mod:`~gossiprouter.client.registrar`: the pure plan of the re-CONNECTs and
  re-SUBSCRIBEs a fresh connection needs;
* :mod:`~gossiprouter.client.merge`: the pure merge of member lists over several routers;
* :mod:`~gossiprouter.client.tls`: the client's TLS set-up;
* :mod:`~gossiprouter.client.front`: RouterStub, which runs the tasks and ties them together.

``gossiprouter.stub`` re-exports the public names from here for older imports.
"""
