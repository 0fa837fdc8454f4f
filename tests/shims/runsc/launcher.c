/*
 * containerd-shim-gvisor-v2: the handler's runtime_type. Runs containerd's runc shim that sits
 * beside it (./runc-shim) with this directory first on PATH, so that the shim's `runc` is the
 * artifact's ./runc (which runs ./runsc) and not the node's runc.
 *
 * Why not the runc shim itself with options.BinaryName: a handler whose runtime_type is a path
 * (as shim-agent writes it) gets its options from containerd's CRI as runtimeoptions.v1.Options,
 * which the runc shim cannot decode ("type with url runtimeoptions.v1.Options: not found"), on
 * 1.6 and 2.x alike; with no options it runs the `runc` on its PATH. Why a compiled file and not
 * a shell script: the agent installs only an ELF executable as the shim.
 *
 * The runc shim starts its long-running copy from /proc/self/exe with this environment, and
 * containerd runs this file again for `delete`: both keep the PATH.
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    (void)argc;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) {
        perror("containerd-shim-gvisor-v2: readlink /proc/self/exe");
        return 127;
    }
    self[n] = '\0';
    const char *dir = dirname(self);

    const char *path = getenv("PATH");
    char *newpath;
    if (asprintf(&newpath, "%s:%s", dir,
                 path && *path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") < 0 ||
        setenv("PATH", newpath, 1) != 0) {
        perror("containerd-shim-gvisor-v2: PATH");
        return 127;
    }

    char shim[PATH_MAX];
    if (snprintf(shim, sizeof shim, "%s/runc-shim", dir) >= (int)sizeof shim) {
        fprintf(stderr, "containerd-shim-gvisor-v2: path too long\n");
        return 127;
    }
    argv[0] = shim;
    execv(shim, argv);
    fprintf(stderr, "containerd-shim-gvisor-v2: exec %s: ", shim);
    perror(NULL);
    return 127;
}
