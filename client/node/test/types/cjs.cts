// The same types from CommonJS (require conditions of the exports map).
import { Client, RedlockdError } from 'redlockd';
import Redlock = require('redlockd/redlock');

export async function main(): Promise<string> {
  const client = new Client({ servers: '127.0.0.1:7390' });
  const lease = await client.acquire(['x', 'y'], { wait: Infinity });
  const f: bigint = lease.fence;
  await lease.release();
  const leader = await client.acquire('leader', { value: '10.0.0.7:5432' });
  await leader.setValue('10.0.0.8:5432');
  for await (const ev of client.watch('leader')) {
    const fence: bigint | undefined = ev.fence;
    if (ev.value !== undefined && fence !== undefined) break;
  }
  await leader.release();
  await client.close();
  const redlock = new Redlock.default(client, { retryCount: -1 });
  await redlock.using(['x'], 1000, async () => undefined);
  const e = new RedlockdError('BUSY', 'held');
  return `${f} ${e.code} ${Redlock.ResourceLockedError.name}`;
}
