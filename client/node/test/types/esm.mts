// A small TypeScript user of the package's types, as an ES module. Checked
// with tsc --noEmit (strict) by the tests, in place and from the packed
// tarball installed into an empty project.
import { Client, Lease, RedlockdError } from 'redlockd';
import type { AcquireOptions, ClientOptions, ErrorCode, FailoverInfo, Locks, Status } from 'redlockd';
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
