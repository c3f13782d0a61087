"""The tf.data operations of ``Dataset``, one module each (as TF keeps one module per op).

Each module defines its Dataset node and registers a builder under the method's name
(``registry.register``); the ``Dataset`` method in ``mpidist.data.base`` checks its arguments
and asks the registry for the builder. The registry keeps the import graph acyclic: these
modules import the ``Dataset`` base class and ``base`` imports only ``registry``.
``mpidist.data`` imports every module here, so the builders are registered before any dataset
is built. This package's ``__init__`` imports nothing.
"""
