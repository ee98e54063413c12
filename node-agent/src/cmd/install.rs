//! `kiln-agent install DIR`: the init container of a compile Job with a foreign compiler image
//! copies this binary into a shared emptyDir, the way Tekton injects its entrypoint. The compiler
//! image may have another C library or none at all, so the binary travels with its own dynamic
//! loader and the libraries it has mapped, and is started as
//! `DIR/ld.so --library-path DIR/lib DIR/kiln-agent …` ([`agent_command`]): nothing of the image's
//! libc is used, and nothing leaks into the compiler it starts (no `LD_LIBRARY_PATH`).
//! Touches `/proc/self`, the target directory, and one run of the copy.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln_crds::inject::agent_command;

use kiln_node_core::error::{Error, Result};

/// Bytes read from the start of the executable to find its interpreter.
const HEAD: usize = 64 * 1024;

/// What `install` copied besides `kiln-agent` and `ld.so`.
#[derive(Debug, serde::Serialize)]
pub struct Installed {
    /// Libraries in `lib/`, by file name.
    pub libraries: Vec<String>,
}

/// Copies the running binary, its loader and its libraries into `dir`, then starts the copy once
/// (`version`) to prove it runs from there.
pub fn install(dir: &Path) -> Result<Installed> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::IncompatibleRuntime(format!(
            "installing kiln-agent into {}: {what}: {e}",
            dir.display()
        ))
    };
    // The program headers and the interpreter path sit at the start of the file.
    let mut head = Vec::with_capacity(HEAD);
    std::fs::File::open("/proc/self/exe")
        .and_then(|f| f.take(HEAD as u64).read_to_end(&mut head))
        .map_err(|e| failed("reading /proc/self/exe", &e))?;
    let loader = interpreter(&head).ok_or_else(|| {
        failed(
            "this kiln-agent has no ELF interpreter",
            &"a static build needs no loader; build kiln-agent dynamically (the default) for injection",
        )
    })?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| failed("reading /proc/self/maps", &e))?;
    let libs = mapped_libraries(&maps);
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir).map_err(|e| failed("creating lib/", &e))?;
    let mut names = Vec::new();
    for lib in &libs {
        let name = lib
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        copy(lib, &lib_dir.join(&name), 0o644)
            .map_err(|e| failed(&lib.display().to_string(), &e))?;
        names.push(name);
    }
    copy(Path::new(&loader), &dir.join("ld.so"), 0o755).map_err(|e| failed(&loader, &e))?;
    copy(Path::new("/proc/self/exe"), &dir.join("kiln-agent"), 0o755)
        .map_err(|e| failed("copying kiln-agent", &e))?;
    let argv = agent_command(&dir.display().to_string(), &["--version"]);
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .output()
        .map_err(|e| failed("starting the copy", &e))?;
    if !out.status.success() {
        return Err(failed(
            "the copy does not run",
            &String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(Installed { libraries: names })
}

fn copy(from: &Path, to: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(from, to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
}

/// The `PT_INTERP` path of a little-endian ELF64 executable.
pub fn interpreter(elf: &[u8]) -> Option<String> {
    if elf.get(..4)? != b"\x7fELF" || elf.get(4)? != &2 || elf.get(5)? != &1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        if u32_at(ph)? != 3 {
            return None; // not PT_INTERP
        }
        let offset = usize::try_from(u64_at(ph + 8)?).ok()?;
        let size = usize::try_from(u64_at(ph + 32)?).ok()?;
        let bytes = elf.get(offset..offset + size)?;
        let path = bytes.split(|b| *b == 0).next()?;
        Some(String::from_utf8_lossy(path).into_owned())
    })
}

/// Shared objects in a `/proc/PID/maps` listing, each once, in order.
pub fn mapped_libraries(maps: &str) -> Vec<PathBuf> {
    let mut seen = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or("");
        let is_lib = name.ends_with(".so") || name.contains(".so.");
        if path.starts_with('/') && is_lib && !seen.iter().any(|p: &PathBuf| p == Path::new(path)) {
            seen.push(PathBuf::from(path));
        }
    }
    seen
}

/// Arguments of `install`.
#[derive(clap::Args)]
pub struct Args {
    /// Target directory (created if missing).
    dir: PathBuf,
}

/// Installs and prints what was copied as JSON; the failure reason goes to stderr.
pub fn main(args: Args) -> ExitCode {
    match install(&args.dir) {
        Ok(installed) => {
            println!("{}", serde_json::to_string(&installed).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent install: {}: {e}", e.reason());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_yield_each_library_once_and_nothing_else() {
        let maps = "\
5581e000-5581f000 r--p 00000000 fd:01 1 /usr/bin/kiln-agent
7f00-7f01 r--p 00000000 fd:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f01-7f02 r-xp 00001000 fd:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f02-7f03 rw-p 00000000 00:00 0
7f03-7f04 r--p 00000000 fd:01 3 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1
7f04-7f05 r--p 00000000 fd:01 4 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7ffd-7ffe rw-p 00000000 00:00 0 [stack]
7ffe-7fff r-xp 00000000 00:00 0 [vdso]
";
        let libs = mapped_libraries(maps);
        let names: Vec<_> = libs
            .iter()
            .map(|p| {
                p.file_name()
                    .expect("a file name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            names,
            ["libc.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"]
        );
    }

    #[test]
    fn interpreter_of_this_test_binary_is_an_existing_loader() {
        let exe = std::fs::read("/proc/self/exe").expect("read self");
        let interp = interpreter(&exe).expect("a dynamic test binary has PT_INTERP");
        assert!(
            interp.starts_with('/') && Path::new(&interp).exists(),
            "{interp}"
        );
        assert_eq!(interpreter(b"#!/bin/sh\n"), None);
    }
}
