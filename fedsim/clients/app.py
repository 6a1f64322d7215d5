"""The one Flower ``ClientApp``: routes each message to the strategy's routine."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv, ClientSpec
from fedsim.clients.defences import train_defended
from fedsim.clients.failures import inject_failures
from fedsim.core import protocol


def build_client_app(
    spec: ClientSpec, routine_name: str, state_dir: Path | None = None
) -> ClientApp:
    """A ``ClientApp`` that runs ``routine_name`` on clients of ``spec``.

    Every reply carries the client's partition id in its metrics: the server
    only sees node ids, and records results per partition. Messages the server
    marked with an injected failure fail in the mod (:mod:`fedsim.simulation.failures`).
    In a run with stragglers, train replies also echo ``straggler`` and the
    ``local-epochs`` the routine trained (:mod:`fedsim.strategies.stragglers`).
    Under central DP with client-side clipping, Flower's ``fixedclipping_mod``
    clips each train reply's update to the norm the server's wrapper sends (a
    train-only mod, inside the failure mod).
    """
    app = ClientApp(mods=[inject_failures])
    routine = CLIENT_ROUTINES.get(routine_name)()

    def env_of(context: Context) -> ClientEnv:
        partition = int(context.node_config[protocol.PARTITION_ID])
        return ClientEnv.create(spec, partition, context.state, state_dir)

    @app.train(mods=[fixedclipping_mod] if spec.central_clipping else None)
    def train(msg: Message, context: Context) -> Message:
        env = env_of(context)
        # The client's defences act inside it, before the reply leaves it.
        sent, config = (
            msg.content.array_records[protocol.ARRAYS],
            msg.content.config_records[protocol.CONFIG],
        )
        arrays, metrics = train_defended(routine, env, sent, config)
        metrics[protocol.PARTITION_ID] = env.partition_id
        if protocol.STRAGGLER in config:  # a run with stragglers: clients.csv records the work
            metrics[protocol.STRAGGLER] = protocol.read_int(config, protocol.STRAGGLER)
            metrics[protocol.LOCAL_EPOCHS] = protocol.read_int(config, protocol.LOCAL_EPOCHS)
        content = RecordDict({protocol.ARRAYS: arrays, protocol.METRICS: MetricRecord(metrics)})
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        env = env_of(context)
        metrics = routine.evaluate(env, msg.content[protocol.ARRAYS], msg.content[protocol.CONFIG])
        metrics[protocol.PARTITION_ID] = env.partition_id
        return Message(content=RecordDict({protocol.METRICS: MetricRecord(metrics)}), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        # Discovery at start-up: the server maps node ids to partitions. The query
        # also warms the actor up (the data; torch imports Dynamo on the first
        # optimizer, seconds), so the first round's reply deadline measures training.
        import torch._dynamo  # noqa: F401

        env = env_of(context)
        metrics = MetricRecord({protocol.PARTITION_ID: env.partition_id})
        return Message(content=RecordDict({protocol.METRICS: metrics}), reply_to=msg)

    return app
