//! The link preflight: before a shim is installed, prove that its ELF interpreter and every
//! shared library it needs, transitively, resolve on the node the way the dynamic loader will
//! resolve them, and name each one that does not ([`check_links`]).
//!
//! A gnu build of runwasi's shims needs `libseccomp.so.2`; on a node without it the shim
//! installs, containerd lists the handler, and every pod dies with exit status 127. This check
//! turns that into one [`ArtifactError::MissingLibraries`] naming what is missing.
//!
//! What it follows (glibc 2.36 sources; musl 1.2 `ldso/dynlink.c` for musl):
//! - the objects are loaded breadth-first, each once (`elf/dl-deps.c`); a need is met by an
//!   object already loaded under that name or `DT_SONAME`, the interpreter included, or by
//!   the same file found again;
//! - per name (`_dl_map_object` in `elf/dl-load.c`): a name with a `/` is a path; else the
//!   `DT_RPATH` of the needing object and of the objects that loaded it, up to the binary
//!   (only when the needing object has no `DT_RUNPATH`; an object with both has no RPATH,
//!   `elf/get-dynamic-info.h`), then the needing object's own `DT_RUNPATH`, then
//!   `/etc/ld.so.cache` and the default directories, both skipped for an object with
//!   `DF_1_NODEFLIB`;
//! - `$ORIGIN`, `$LIB` and `$PLATFORM` in those lists and in `DT_NEEDED`
//!   (`_dl_dst_substitute`); `$ORIGIN` is the directory of the object as found;
//! - a candidate of another ELF class or machine is skipped; one that is not a loadable ELF
//!   shared object stops the search with an error, as `open_verify` does;
//! - the cache entries taken are those `_dl_cache_check_flags` accepts for the machine;
//! - musl (`ld-musl-*` interpreter): the `DT_RUNPATH` or `DT_RPATH` of the needing object and
//!   its loaders, then `/etc/ld-musl-<arch>.path` or `/lib:/usr/local/lib:/usr/lib`; the first
//!   file found is the answer; `libc.so`, `libpthread.so.0` and the other names musl keeps
//!   for itself are the interpreter;
//! - the interpreter (`PT_INTERP`) must be a regular file of the binary's class and machine.
//!
//! Assumptions: host paths (the interpreter, absolute list entries, the cache's paths, the
//! default directories) are looked up under the [`HostRoot`]; the binary and what `$ORIGIN`
//! reaches from it are real paths (the verified copy in the store has the tree it will be
//! placed with).
//!
//! Caveats: the environment is not known (`LD_LIBRARY_PATH`, `LD_PRELOAD`,
//! `/etc/ld.so.preload` are not considered), nor the working directory (relative entries are
//! skipped); symbol versions (`GLIBC_2.34 not found`) are not checked; glibc-hwcaps
//! subdirectories are used only through the cache, preferring its entries every CPU can use.
//! One deliberate difference: a glibc root without a readable cache (an image whose
//! `ldconfig` has not run yet) is searched in the directories `/etc/ld.so.conf` names, which
//! the cache will hold, before the defaults.
//!
//! Bounds, for hostile files: at most [`MAX_OBJECTS`] objects, [`MAX_PROBES`] lookups,
//! a bounded read of each object (`dynamic::MAX_BYTES_READ`), a cache of at most 32 MiB.

mod cache;
mod dynamic;
mod search;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use object::elf;

use self::cache::LdCache;
use self::dynamic::{DynInfo, ElfProblem, FileSource, Ident, read_dyn_info, read_ident};
use self::search::{Loc, Tokens};
use super::ArtifactError;
use crate::hostroot::HostRoot;

/// At most this many objects (the binary and its libraries) are examined.
pub const MAX_OBJECTS: usize = 512;
/// At most this many steps in one check: needs met, links of loader chains walked, candidate
/// paths visited (each file looked at is one).
pub const MAX_PROBES: usize = 100_000;

/// What the loader would load for one binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkReport {
    /// `PT_INTERP`, as the binary names it.
    pub interpreter: Option<String>,
    /// The libraries, in the order the loader maps them.
    pub libraries: Vec<ResolvedLibrary>,
    /// No interpreter and no `DT_NEEDED` (or not ELF at all): nothing to resolve.
    pub is_static: bool,
}

/// One library and where the loader finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLibrary {
    /// The `DT_NEEDED` name.
    pub name: String,
    /// The host path as the node sees it, or the real path for what `$ORIGIN` reaches.
    pub path: String,
}

/// Check that `binary`'s interpreter and libraries resolve under `root`.
///
/// `binary` is the real path of the file (the verified copy in the store); absolute paths
/// the loader would use are looked up with `root.resolve`; `$ORIGIN` is `binary`'s real
/// directory. Not ELF, or no interpreter and no `DT_NEEDED`: a static report. An ELF file
/// that cannot be read as one: [`ArtifactError::NotExecutable`]. Anything missing:
/// [`ArtifactError::MissingLibraries`], naming each in the order first needed.
pub fn check_links(root: &HostRoot, binary: &Path) -> Result<LinkReport, ArtifactError> {
    let src =
        FileSource::open(binary).map_err(|e| ArtifactError::io("open shim binary", binary, e))?;
    let (ident, info) = match read_dyn_info(&src) {
        Ok(found) => found,
        Err(ElfProblem::NotElf) => return Ok(LinkReport::statically_linked()),
        Err(ElfProblem::Malformed(detail)) => return Err(not_executable(binary, detail)),
        Err(ElfProblem::Io(e)) => return Err(ArtifactError::io("read shim binary", binary, e)),
    };
    if ident.e_type != elf::ET_EXEC && ident.e_type != elf::ET_DYN {
        let detail = format!("ELF type {} is not an executable", ident.e_type);
        return Err(not_executable(binary, detail));
    }
    if info.interp.is_none() && info.needed.is_empty() {
        return Ok(LinkReport::statically_linked());
    }
    let real = std::fs::canonicalize(binary)
        .map_err(|e| ArtifactError::io("resolve shim binary", binary, e))?;
    let interpreter = info.interp.clone();
    let musl = interpreter.as_deref().is_some_and(search::is_musl_loader);
    let cache_bytes = if musl { None } else { search::read_cache(root) };
    let cache = cache_bytes
        .as_deref()
        .and_then(|b| LdCache::parse(b, ident.big_endian).ok());
    let fallback = match (&interpreter, musl, &cache) {
        (Some(interp), true, _) => search::musl_dirs(root, interp),
        (_, false, None) => search::conf_dirs(root),
        _ => Vec::new(),
    };
    let mut walk = Walk::new(root, ident, musl, cache.as_ref(), fallback);
    if let Some(interp) = &interpreter {
        walk.check_interpreter(interp);
    }
    walk.add(Loc::Real(real), info, None);
    walk.run()
        .map_err(|detail| not_executable(binary, detail))?;
    if !walk.missing.is_empty() {
        return Err(ArtifactError::MissingLibraries {
            path: binary.to_path_buf(),
            missing: walk.missing,
        });
    }
    Ok(LinkReport {
        interpreter,
        libraries: walk.libraries,
        is_static: false,
    })
}

impl LinkReport {
    fn statically_linked() -> Self {
        LinkReport {
            interpreter: None,
            libraries: Vec::new(),
            is_static: true,
        }
    }
}

fn not_executable(path: &Path, detail: String) -> ArtifactError {
    ArtifactError::NotExecutable {
        path: path.to_path_buf(),
        detail,
    }
}

/// One loaded object: where it was found, what it needs, which object loaded it, and its
/// search lists expanded once.
struct Object {
    loc: Loc,
    info: DynInfo,
    loader: Option<usize>,
    /// What the objects it loads search too: glibc's `DT_RPATH`; for musl, its `DT_RUNPATH`
    /// or `DT_RPATH`.
    inherited: Rc<[Loc]>,
    /// What only its own needs search: glibc's `DT_RUNPATH`.
    own: Rc<[Loc]>,
}

/// What looking at one candidate file gave.
enum Verdict {
    /// A shared object the loader would map (its identity: the canonical local path).
    Good(Loc, DynInfo, PathBuf),
    /// Absent, or of another class or machine: the search goes on.
    Skip,
    /// There, but not loadable: the loader stops with an error.
    Unusable(Loc, String),
}

/// One run of the loader, on paper.
struct Walk<'a> {
    root: &'a HostRoot,
    ident: Ident,
    musl: bool,
    cache: Option<&'a LdCache<'a>>,
    /// musl's search path, or the `ld.so.conf` directories when there is no cache.
    fallback: Vec<Loc>,
    defaults: Vec<Loc>,
    lib_tokens: Vec<String>,
    objects: Vec<Object>,
    /// Names a need is met by: those loaded, their sonames, the interpreter's.
    known: HashSet<String>,
    files: HashSet<PathBuf>,
    missing: Vec<String>,
    missing_names: HashSet<String>,
    libraries: Vec<ResolvedLibrary>,
    probes: usize,
}

impl<'a> Walk<'a> {
    fn new(
        root: &'a HostRoot,
        ident: Ident,
        musl: bool,
        cache: Option<&'a LdCache<'a>>,
        fallback: Vec<Loc>,
    ) -> Self {
        Walk {
            root,
            ident,
            musl,
            cache,
            fallback,
            defaults: if musl {
                Vec::new()
            } else {
                search::default_dirs(&ident)
            },
            lib_tokens: search::lib_tokens(&ident),
            objects: Vec::new(),
            known: HashSet::new(),
            files: HashSet::new(),
            missing: Vec::new(),
            missing_names: HashSet::new(),
            libraries: Vec::new(),
            probes: 0,
        }
    }

    fn miss(&mut self, name: &str, report: String) {
        if self.missing_names.insert(name.to_string()) {
            self.missing.push(report);
        }
    }

    /// The interpreter must be a regular file under the root, an ELF object of the binary's
    /// class and machine (the kernel refuses others).
    fn check_interpreter(&mut self, interp: &str) {
        let key = format!("interpreter {interp}");
        // Whatever needs it by its file name (libc needs `ld-linux-x86-64.so.2`) is reported
        // with it, not again.
        let file_name = interp.rsplit('/').next().unwrap_or(interp);
        self.missing_names.insert(file_name.to_string());
        if !interp.starts_with('/') {
            return self.miss(&key, format!("{key} (not an absolute path)"));
        }
        let local = Loc::Host(interp.to_string()).local(self.root);
        let Some(local) = local.filter(|p| p.is_file()) else {
            return self.miss(&key, key.clone());
        };
        let why = match FileSource::open(&local)
            .map_err(ElfProblem::Io)
            .and_then(|s| read_dyn_info(&s))
        {
            Ok((id, _)) if !self.same_machine(&id) => "built for another machine".to_string(),
            Ok((_, info)) => {
                self.missing_names.remove(file_name);
                self.known.insert(interp.to_string());
                self.known.extend(info.soname);
                self.files
                    .insert(std::fs::canonicalize(&local).unwrap_or(local));
                return;
            }
            Err(ElfProblem::NotElf) => "not an ELF file".to_string(),
            Err(ElfProblem::Malformed(d)) => d,
            Err(ElfProblem::Io(e)) => e.to_string(),
        };
        self.miss(&key, format!("{key} ({why})"));
    }

    fn same_machine(&self, id: &Ident) -> bool {
        id.class64 == self.ident.class64 && id.machine == self.ident.machine
    }

    /// Breadth-first over the objects, as `_dl_map_object_deps` loads them.
    fn run(&mut self) -> Result<(), String> {
        let mut next = 0;
        while next < self.objects.len() {
            let needed = self.objects[next].info.needed.clone();
            for name in needed {
                self.need(next, &name)?;
            }
            next += 1;
        }
        Ok(())
    }

    /// Meet one `DT_NEEDED` of object `by`.
    fn need(&mut self, by: usize, name: &str) -> Result<(), String> {
        if self.known.contains(name) || self.missing_names.contains(name) {
            return Ok(());
        }
        if self.musl && search::is_musl_self(name) {
            return Ok(());
        }
        self.step()?;
        match self.find(by, name)? {
            Verdict::Good(loc, info, file) => {
                self.known.insert(name.to_string());
                if !self.files.insert(file) {
                    return Ok(()); // the same file, already loaded under another name
                }
                if self.objects.len() >= MAX_OBJECTS {
                    return Err(format!(
                        "its dependency tree has more than {MAX_OBJECTS} shared objects"
                    ));
                }
                self.known.extend(info.soname.clone());
                self.libraries.push(ResolvedLibrary {
                    name: name.to_string(),
                    path: loc.display(),
                });
                self.add(loc, info, Some(by));
            }
            Verdict::Skip => self.miss(name, name.to_string()),
            Verdict::Unusable(loc, why) => {
                self.miss(name, format!("{name} ({}: {why})", loc.display()));
            }
        }
        Ok(())
    }

    /// Add an object, its search lists expanded (`$ORIGIN` is its directory).
    fn add(&mut self, loc: Loc, info: DynInfo, loader: Option<usize>) {
        let origin = loc.parent();
        let tokens = Tokens {
            origin: &origin,
            lib: &self.lib_tokens,
            platform: (!self.musl).then(|| search::platform(&self.ident)),
        };
        let expand = |list: Option<&String>| -> Rc<[Loc]> {
            list.map(|l| search::expand_path_list(l, &tokens))
                .unwrap_or_default()
                .into()
        };
        let (inherited, own) = if self.musl {
            (
                expand(info.runpath.as_ref().or(info.rpath.as_ref())),
                Rc::from([]),
            )
        } else {
            (expand(info.rpath.as_ref()), expand(info.runpath.as_ref()))
        };
        self.objects.push(Object {
            loc,
            info,
            loader,
            inherited,
            own,
        });
    }

    /// Where object `by`'s need `name` is found, in the loader's order.
    fn find(&mut self, by: usize, name: &str) -> Result<Verdict, String> {
        if name.contains('/') {
            let origin = self.objects[by].loc.parent();
            let tokens = Tokens {
                origin: &origin,
                lib: &self.lib_tokens,
                platform: (!self.musl).then(|| search::platform(&self.ident)),
            };
            let paths = search::expand_path_list(name, &tokens);
            return self.first_of(paths.iter());
        }
        if self.musl || self.objects[by].info.runpath.is_none() {
            let mut l = Some(by);
            while let Some(at) = l {
                self.step()?;
                let dirs = Rc::clone(&self.objects[at].inherited);
                let found = self.first_in(&dirs, name)?;
                if !matches!(found, Verdict::Skip) {
                    return Ok(found);
                }
                l = self.objects[at].loader;
            }
        }
        let own = Rc::clone(&self.objects[by].own);
        let found = self.first_in(&own, name)?;
        let nodeflib = self.objects[by].info.nodeflib && !self.musl;
        if !matches!(found, Verdict::Skip) || nodeflib {
            return Ok(found);
        }
        if let Some(path) = self.cache_path(name) {
            let found = self.first_of([Loc::Host(path)].iter())?;
            if !matches!(found, Verdict::Skip) {
                return Ok(found);
            }
        }
        let rest: Vec<Loc> = self
            .fallback
            .iter()
            .chain(&self.defaults)
            .cloned()
            .collect();
        self.first_in(&rest, name)
    }

    /// Charge one step (a need, a link of the loader chain, a path visited) to the budget.
    fn step(&mut self) -> Result<(), String> {
        self.probes += 1;
        if self.probes > MAX_PROBES {
            return Err(format!(
                "resolving its libraries would take more than {MAX_PROBES} lookups"
            ));
        }
        Ok(())
    }

    fn cache_path(&self, name: &str) -> Option<String> {
        let ident = self.ident;
        self.cache?
            .lookup(name, |flags| search::cache_flags_fit(&ident, flags))
    }

    /// The first of `dirs` holding a usable `name`.
    fn first_in(&mut self, dirs: &[Loc], name: &str) -> Result<Verdict, String> {
        let paths: Vec<Loc> = dirs.iter().map(|d| d.join(name)).collect();
        self.first_of(paths.iter())
    }

    /// The first of `paths` that is not skipped; each path visited costs one step (the
    /// loader's own list is free of repeats: a path it has tried is not tried again here).
    fn first_of<'p>(&mut self, paths: impl Iterator<Item = &'p Loc>) -> Result<Verdict, String> {
        let mut tried = HashSet::new();
        for loc in paths {
            self.step()?;
            if !tried.insert(loc) {
                continue;
            }
            let verdict = self.look_at(loc);
            if !matches!(verdict, Verdict::Skip) {
                return Ok(verdict);
            }
        }
        Ok(Verdict::Skip)
    }

    /// What the loader makes of the file at `loc` (`open_verify`).
    fn look_at(&self, loc: &Loc) -> Verdict {
        let Some(local) = loc.local(self.root).filter(|p| p.is_file()) else {
            return Verdict::Skip;
        };
        let Ok(src) = FileSource::open(&local) else {
            return Verdict::Skip;
        };
        let unusable = |why: String| Verdict::Unusable(loc.clone(), why);
        let id = match read_ident(&src) {
            Ok(id) => id,
            Err(ElfProblem::NotElf) => return unusable("invalid ELF header".into()),
            Err(ElfProblem::Malformed(d)) => return unusable(d),
            Err(ElfProblem::Io(e)) => return unusable(e.to_string()),
        };
        if !self.same_machine(&id) {
            return match self.musl {
                true => unusable("built for another machine".into()),
                false => Verdict::Skip,
            };
        }
        if id.big_endian != self.ident.big_endian {
            return unusable("ELF data encoding differs from the binary's".into());
        }
        if id.e_type != elf::ET_DYN {
            return unusable(format!("ELF type {} is not a shared object", id.e_type));
        }
        match read_dyn_info(&src) {
            Ok((_, info)) => {
                let file = std::fs::canonicalize(&local).unwrap_or(local);
                // A real path is reported (and is `$ORIGIN` to its own needs) as the file
                // it is; a host path as the loader names it.
                let loc = match loc {
                    Loc::Real(_) => Loc::Real(file.clone()),
                    Loc::Host(_) => loc.clone(),
                };
                Verdict::Good(loc, info, file)
            }
            Err(ElfProblem::NotElf) => unusable("invalid ELF header".into()),
            Err(ElfProblem::Malformed(d)) => unusable(d),
            Err(ElfProblem::Io(e)) => unusable(e.to_string()),
        }
    }
}
