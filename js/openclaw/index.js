// The OpenClaw plugin: registers abridge's context engine (`@abridge/engine/openclaw`, the
// npm package's component in process) under the id "abridge"; select it with
// plugins.slots.contextEngine = "abridge" (`openclaw plugins install -l` does).
//
// OpenClaw loads a plugin's entry synchronously (require), so the engine, whose module
// instantiates the component when it loads, is imported when OpenClaw first asks for it.
const ENGINE_ID = 'abridge';

export default function register(api) {
  api.registerContextEngine(ENGINE_ID, async (ctx) => {
    let mod;
    try {
      mod = await import('@abridge/engine/openclaw');
    } catch (e) {
      throw new Error(
        `the abridge plugin cannot load @abridge/engine (${e.message}): install the plugin with its dependencies (npm install in the plugin's folder, the engine's packed tarball included; js/openclaw/README.md)`,
      );
    }
    // (The factory's ctx.config is all of OpenClaw's config; the plugin's own entry is
    // api.pluginConfig.)
    return mod.createContextEngine(api.pluginConfig ?? {}, ctx ?? {});
  });
}
