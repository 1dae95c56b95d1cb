// Older setups (moduleResolution "node10", no exports maps): the
// "types" and "typesVersions" fields.
import { Client } from 'redlockd';
import Redlock, { ResourceLockedError } from 'redlockd/redlock';

export function make(): [Client, Redlock, string] {
  const client = new Client({ servers: ['127.0.0.1:7390'] });
  return [client, new Redlock(client), ResourceLockedError.name];
}
