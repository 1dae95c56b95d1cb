/**
 * redlockd: the Node.js client of redlockd, the Redlock lock service.
 *
 *     import { Client } from 'redlockd';
 *     const client = new Client({ servers: ['127.0.0.1:7390'], name: 'billing' });
 *     await client.using('invoice:1001', { ttl: 30000, wait: 5000 }, async (lease) => {
 *       await storage.write(row, { fence: lease.fence, signal: lease.signal });
 *     });
 *     await client.close();
 */
export { Client } from './client.js';
export type {
  AcquireOptions,
  ClientEvents,
  ClientOptions,
  FailoverInfo,
  LockInfo,
  Locks,
  ReconnectInfo,
  ServerInfo,
  Status,
  StatusHolder,
  TlsOptions,
} from './types.js';
export { Lease } from './lease.js';
export type { ExtendOptions, LeaseState } from './lease.js';
export { Watch } from './watch.js';
export type { HolderEvent, WatchOptions } from './watch.js';
export { RedlockdError } from './errors.js';
export type { ErrorCode, LostReason } from './errors.js';
