// A small TypeScript user of the package's types, as an ES module. Checked
// with tsc --noEmit (strict) by the tests, in place and from the packed
// tarball installed into an empty project.
import { Client, Lease, RedlockdError, Watch } from 'redlockd';
import type {
  AcquireOptions,
  ClientOptions,
  ErrorCode,
  ExtendOptions,
  FailoverInfo,
  HolderEvent,
  Locks,
  Status,
  StatusHolder,
  WatchOptions,
} from 'redlockd';
import Redlock, { ExecutionError, Lock, ResourceLockedError } from 'redlockd/redlock';
import type { ExecutionResult, RedlockAbortSignal, Settings } from 'redlockd/redlock';

const options: ClientOptions = {
  servers: ['127.0.0.1:7390', 'tls://b.example:7391', 'unix:/run/redlockd/redlockd.sock'],
  name: 'billing-1',
  password: 's3cret',
  user: 'billing',
  tls: { ca: '-----BEGIN CERTIFICATE-----', cert: Buffer.from(''), key: Buffer.from(''), servername: 'b.example' },
  detach: 30000,
  timeout: 5000,
};
const client = new Client(options);

export async function work(): Promise<bigint> {
  const acquire: AcquireOptions = { ttl: 30000, wait: 5000, mode: 'shared', renew: true, signal: AbortSignal.timeout(100) };
  const fence: bigint = await client.using('invoice:1001', acquire, async (lease: Lease) => {
    const resources: readonly string[] = lease.resources;
    const token: string = lease.token;
    const deadline: number = lease.deadline;
    const signal: AbortSignal = lease.signal;
    const state: 'held' | 'unconfirmed' | 'lost' | 'released' = lease.state;
    void resources, token, deadline, signal, state;
    lease.check();
    const same: Lease = await lease.extend(60000);
    return same.fence;
  });
  const n: number = await client.using(['a', 'b'], () => 1);
  const lease = await client.acquire('job:1', { limit: 4 });
  const slot: number | undefined = lease.slot;
  await lease.release();
  const st: Status = await client.status('job:1');
  const held: boolean = st.held;
  const locks: Locks = await client.locks();
  const pong: string = await client.ping('x');
  void n, slot, held, locks, pong;
  try {
    await client.acquire('job:2');
  } catch (e) {
    if (e instanceof RedlockdError) {
      const code: ErrorCode | string = e.code;
      if (e.code === 'BUSY' || e.code === 'LOST') console.log(code, e.resource, e.reason);
    }
  }
  client.on('failover', (info: FailoverInfo) => console.log(info.adopted, info.lost, info.server));
  client.on('reconnect', (info) => console.log(info.resumed));
  client.on('lost', (l, err) => console.log(l.resource, err.code));
  client.on('error', (err) => console.log(err.message));
  // @ts-expect-error: the fence is a bigint, not a number
  const wrong: number = lease.fence;
  void wrong;
  await client.close();
  return fence;
}

// Holder values, watches, a leader election.
export async function leader(): Promise<string | undefined> {
  const lease = await client.acquire('leader:db', { wait: Infinity, value: '10.0.0.7:5432' });
  const mine: string | undefined = lease.value;
  const same: Lease = await lease.setValue('10.0.0.8:5432');
  const ext: ExtendOptions = { value: '10.0.0.9:5432' };
  await same.extend(30000, ext);
  await lease.extend(30000);
  const fromUsing: string | undefined = await client.using('leader:db', { wait: Infinity, value: 'addr' }, async (l) => l.value);
  const st: Status = await client.status('leader:db');
  const holder: StatusHolder | null = st.holder;
  const value: string | undefined = st.holder?.value;
  const name: string | null | undefined = holder?.name;
  const fence: number | undefined = holder?.fence;
  const lockValue: string | undefined = (await client.locks()).locks[0]?.value;
  void fromUsing, value, name, fence, lockValue;

  const opts: WatchOptions = { signal: AbortSignal.timeout(1000) };
  const watch: Watch = client.watch('leader:db', 'other', opts);
  const byArray: Watch = client.watch(['a', 'b'], { signal: new AbortController().signal });
  const one: Watch = client.watch('a');
  const names: readonly string[] = watch.resources;
  await watch.ready;
  let leaderNow: string | undefined;
  for await (const ev of watch) {
    const e: HolderEvent = ev;
    const f: bigint | undefined = ev.fence;
    const held: number = ev.held;
    const mode: 'exclusive' | 'shared' | 'semaphore' | undefined = ev.mode;
    const who: string | undefined = ev.name;
    const daemon: string | undefined = ev.daemon;
    const foreign: boolean = ev.foreign;
    const limit: number | undefined = ev.limit;
    void e, f, held, mode, who, daemon, foreign, limit;
    // @ts-expect-error: an event is read-only
    ev.value = 'x';
    leaderNow = ev.value;
    if (leaderNow !== undefined) break;
  }
  const r = await byArray.next();
  if (!r.done) {
    const e: HolderEvent = r.value;
    void e;
  }
  await byArray.return();
  await one.close();
  void names;
  client.on('holder', (ev) => console.log(ev.resource, ev.held, ev.value));
  // @ts-expect-error: a value is a string
  await lease.setValue(5);
  // @ts-expect-error: resources are strings
  client.watch(1);
  return mine ?? leaderNow;
}

export async function compat(): Promise<void> {
  const settings: Partial<Settings> = { retryCount: 10, retryDelay: 200, retryJitter: 200, automaticExtensionThreshold: 500 };
  const redlock = new Redlock(['127.0.0.1:7390'], settings);
  redlock.on('error', (error) => {
    if (error instanceof ResourceLockedError) return;
    console.error(error);
  });
  const out: string = await redlock.using(['a', 'b'], 5000, async (signal: RedlockAbortSignal) => {
    if (signal.aborted) throw signal.error;
    return 'done';
  });
  let lock: Lock = await redlock.acquire(['a'], 5000);
  lock = await lock.extend(5000);
  const value: string = lock.value;
  const expiration: number = lock.expiration;
  const result: ExecutionResult = await lock.release();
  try {
    await redlock.acquire(['a'], 5000, { retryCount: 0 });
  } catch (e) {
    if (e instanceof ExecutionError) console.log(e.attempts.length);
  }
  void out, value, expiration, result;
  await redlock.quit();
}
