// The same types from CommonJS (require conditions of the exports map).
import { Client, RedlockdError } from 'redlockd';
import Redlock = require('redlockd/redlock');

export async function main(): Promise<string> {
  const client = new Client({ servers: '127.0.0.1:7390' });
  const lease = await client.acquire(['x', 'y'], { wait: Infinity });
  const f: bigint = lease.fence;
  await lease.release();
  await client.close();
  const redlock = new Redlock.default(client, { retryCount: -1 });
  await redlock.using(['x'], 1000, async () => undefined);
  const e = new RedlockdError('BUSY', 'held');
  return `${f} ${e.code} ${Redlock.ResourceLockedError.name}`;
}
