// Builds dist/esm (ES modules) and dist/cjs (CommonJS), each with its .d.ts
// files, from src/ with the pinned tsc; dist/cjs gets a package.json that
// says "commonjs" (the package itself is "type": "module").
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
let tsc;
try {
  tsc = createRequire(join(root, 'package.json')).resolve('typescript/bin/tsc');
} catch {
  process.stderr.write('build: typescript is not installed here: run npm ci in client/node\n');
  process.exit(1);
}
rmSync(join(root, 'dist'), { recursive: true, force: true });
for (const project of ['tsconfig.esm.json', 'tsconfig.cjs.json']) {
  const r = spawnSync(process.execPath, [tsc, '-p', join(root, project)], { stdio: 'inherit' });
  if (r.status !== 0) process.exit(r.status ?? 1);
}
mkdirSync(join(root, 'dist', 'cjs'), { recursive: true });
writeFileSync(join(root, 'dist', 'cjs', 'package.json'), '{\n  "type": "commonjs"\n}\n');
