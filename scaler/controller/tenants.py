"""Tenants' quotas an operator sets while the scaler runs (`scaler quota`), held by every node.

The limits file's `tenants` are the quotas a node starts with; one an operator sets goes over the
file's for its tenant, in the `scaler_tenants` KV bucket: stored like the stream (synced, replicated),
each change a revision of its tenant's key (`nats kv history scaler_tenants`, the last HISTORY kept),
so a restart keeps it. The node that took the change holds it at once and tells the others
(`scaler.tenants.quotas`), who read the bucket again: every node holds every call to it within a
moment. Each also reads it every READ_EVERY_S, for a word lost or a change made in the bucket by
hand. A tenant's functions' instances are counted across nodes as the run's totals are
(scaler/controller/shared.py).
"""

import asyncio
import contextlib
import logging

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from scaler.controller.core.limits import TenantQuota
from scaler.controller.ledger import Ledger
from scaler.runtime.bus import answered
from scaler.runtime.kv import entries
from scaler.runtime.tasks import cancelled

log = logging.getLogger("scaler.controller.tenants")

BUCKET = "scaler_tenants"
CHANGED = "scaler.tenants.quotas"  # a quota was set: read the bucket again
HISTORY = 16  # changes kept per tenant
READ_EVERY_S = 10.0  # read anyway: a word lost, or a quota changed in the bucket by hand
_decoder = msgspec.msgpack.Decoder(TenantQuota)


class TenantQuotas:
    def __init__(self, nc: Client, ledger: Ledger, replicas: int) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.ledger = ledger  # its `quotas` are what the bucket holds
        self.replicas = replicas
        self._kv: KeyValue | None = None
        self._sub: Subscription | None = None
        self._told = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._kv = await _bucket(self.js, self.replicas)
        self._sub = await self.nc.subscribe(CHANGED, cb=self._changed)
        await self.read()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancelled(self._task)
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    async def set(self, tenant: str, quota: TenantQuota | None) -> None:
        """Set a tenant's quota over the limits file's (None: the file's again), for every node."""
        if quota is None:
            with contextlib.suppress(NotFoundError):
                await self._kv.delete(tenant)
        else:
            await self._kv.put(tenant, msgspec.msgpack.encode(quota))
        log.info("tenant %s: quota %s", tenant, quota if quota is not None else "as the limits file says")
        await self.read()
        await self.nc.publish(CHANGED)

    async def read(self) -> None:
        quotas = {}
        for tenant, value in (await entries(self.js, BUCKET)).items():
            try:
                quotas[tenant] = _decoder.decode(value)
            except msgspec.DecodeError as e:
                log.warning("tenant %s: unreadable quota in %s: %s", tenant, BUCKET, e)
        if quotas != self.ledger.quotas:
            self.ledger.quotas = quotas

    async def _changed(self, _: Msg) -> None:
        self._told.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._told.wait(), READ_EVERY_S)
            self._told.clear()
            with contextlib.suppress(Exception):  # NATS away: the quotas are as last read
                await self.read()


async def _bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    """The bucket, created if missing: no TTL (a quota holds until changed), a few revisions of each."""
    try:
        kv = await js.key_value(BUCKET)
    except BucketNotFoundError:
        config = KeyValueConfig(bucket=BUCKET, history=HISTORY, storage=StorageType.FILE, replicas=replicas)
        try:
            kv = await js.create_key_value(config)
        except Exception:  # another node made it meanwhile
            kv = await js.key_value(BUCKET)
    await answered(kv.status)
    return kv
