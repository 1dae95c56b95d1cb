// tls:// servers: the daemon's certificate checked against a CA and the
// host, a client certificate for a daemon that verifies clients, and the
// failover machinery over TLS. The PKI is the C tests' throwaway one
// (tests/tools/mkcerts.sh, run here into a temporary directory).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import { Client, RedlockdError } from '../dist/esm/index.js';
import { Harness, Proxy, REPO } from './harness.mjs';

const h = new Harness();
let certs;
let daemon;
let verifying;
const clients = [];
const pem = (name) => readFileSync(join(certs, name));

function client(options) {
  const c = new Client({ timeout: 2000, ...options });
  c.on('error', () => {});
  clients.push(c);
  return c;
}

// Node 18's runner runs top-level hooks after the suites: every hook and
// suite is inside this one.
describe('tls:// servers', () => {
  before(async () => {
    certs = h.mkdtemp('certs');
    const r = spawnSync(join(REPO, 'tests', 'tools', 'mkcerts.sh'), [certs], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const nodes = await h.redis(1);
    const tls = { cert_file: join(certs, 'server.crt'), key_file: join(certs, 'server.key') };
    daemon = await h.daemon(nodes, { tls });
    verifying = await h.daemon(nodes, {
      tls: { ...tls, ca_file: join(certs, 'ca.crt'), verify_clients: true },
      auth: { users: [{ name: 'alice', password: 'alicepw', prefixes: ['a:'] }] },
    });
  });

  after(async () => {
    for (const c of clients) await c.close();
    await h.cleanup();
  });

  describe('TLS', () => {
    it('checks the daemon against the CA and the address', async () => {
      const c = client({ servers: [daemon.tlsServer], tls: { ca: pem('ca.crt') } });
      const lease = await c.acquire('tls:1');
      await lease.release();
      // The name the certificate must carry, given apart from the address.
      const named = client({ servers: [daemon.tlsServer], tls: { ca: pem('ca.crt'), servername: 'localhost' } });
      await (await named.acquire('tls:2')).release();
    });

    it('refuses a daemon its CA did not sign, or a wrong name', async () => {
      const c = client({ servers: [daemon.tlsServer], tls: { ca: pem('other-ca.crt') } });
      await assert.rejects(c.acquire('tls:3'), (e) => e instanceof RedlockdError && e.code === 'CONNECTION' && /certificate/i.test(e.message));
      const wrong = client({ servers: [daemon.tlsServer], tls: { ca: pem('ca.crt'), servername: 'elsewhere.test' } });
      await assert.rejects(wrong.acquire('tls:3'), (e) => e.code === 'CONNECTION');
    });

    it('presents a client certificate whose CN names a user', async () => {
      const c = client({
        servers: [verifying.tlsServer],
        tls: { ca: pem('ca.crt'), cert: pem('client.crt'), key: pem('client.key') },
      });
      await (await c.acquire('a:1')).release(); // logged in as alice, no AUTH
      await assert.rejects(c.acquire('b:1'), (e) => e.code === 'DENIED');
    });

    it('resumes the session over TLS after a dropped connection', async () => {
      const proxy = await new Proxy(daemon.tlsPort).listen();
      try {
        const c = client({ servers: [`tls://${proxy.address}`], tls: { ca: pem('ca.crt') } });
        const lease = await c.acquire('tls:resume', { ttl: 3000 });
        const reconnected = new Promise((res) => c.once('reconnect', res));
        proxy.cut();
        const info = await reconnected;
        assert.equal(info.resumed, true);
        assert.equal(lease.state, 'held');
        await lease.release();
      } finally {
        await proxy.close();
      }
    });
  });
});
