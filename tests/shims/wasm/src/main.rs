//! `containerd-shim-wasmi-v1`: a containerd shim (runtime `io.containerd.wasmi.v1`) that runs
//! WASI preview 1 modules with the wasmi interpreter, on top of runwasi's
//! `containerd-shim-wasm` (which runs the container through youki's libcontainer).

use anyhow::Result;
use containerd_shim_wasm::sandbox::Sandbox;
use containerd_shim_wasm::sandbox::context::RuntimeContext;
use containerd_shim_wasm::shim::{Cli, Shim, Version};
use wasmi::{Engine, Linker, Module, Store};
use wasmi_wasi::{Dir, WasiCtx, WasiCtxBuilder, ambient_authority};

struct WasmiShim;

#[derive(Default)]
struct WasmiSandbox;

impl Shim for WasmiShim {
    type Sandbox = WasmiSandbox;

    fn name() -> &'static str {
        "wasmi"
    }

    fn version() -> Version {
        Version {
            version: env!("CARGO_PKG_VERSION"),
            revision: "<none>",
        }
    }
}

impl Sandbox for WasmiSandbox {
    async fn run_wasi(&self, ctx: &impl RuntimeContext) -> Result<i32> {
        let entrypoint = ctx.entrypoint();
        let engine = Engine::default();
        let module = Module::new(&engine, entrypoint.source.as_bytes()?)?;

        // Runs inside the container: its rootfs is "/", its stdio is the container's.
        let mut wasi = WasiCtxBuilder::new();
        wasi.inherit_stdio().args(ctx.args())?;
        for env in ctx.envs() {
            let (key, value) = env.split_once('=').unwrap_or((env, ""));
            wasi.env(key, value)?;
        }
        wasi.preopened_dir(Dir::open_ambient_dir("/", ambient_authority())?, "/")?;

        let mut store = Store::new(&engine, wasi.build());
        let mut linker = Linker::<WasiCtx>::new(&engine);
        wasmi_wasi::add_to_linker(&mut linker, |wasi| wasi)?;
        let instance = linker.instantiate_and_start(&mut store, &module)?;
        let func = instance.get_typed_func::<(), ()>(&store, &entrypoint.func)?;
        match func.call(&mut store, ()) {
            Ok(()) => Ok(0),
            Err(err) => err.i32_exit_status().ok_or(err.into()),
        }
    }
}

fn main() {
    WasmiShim::run(None);
}
