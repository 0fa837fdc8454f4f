# shim-agent %post (packaging/rpm/README.md). $1: 1 on install, 2 or more on upgrade.
# Never starts or enables the service: enabling it is the admin's or the image builder's
# choice (systemctl enable shim-agent). In an image build (chroot, rpm --root, a container:
# no /run/systemd/system) no systemctl is called at all.

# The static Shims directory (cargo-generate-rpm cannot package an empty directory).
mkdir -p /etc/shim-agent/shims.d || :
# /opt/shim-agent must exist before the unit starts (its ReadWritePaths= names it). On a live
# host systemd-tmpfiles makes it (as every boot does); in an image build, where
# systemd-tmpfiles wants a mounted /proc, a plain mkdir (the same directory, 0755 root).
if [ -d /run/systemd/system ] && command -v systemd-tmpfiles >/dev/null 2>&1; then
    systemd-tmpfiles --create shim-agent.conf || :
fi
mkdir -p /opt/shim-agent && chmod 0755 /opt/shim-agent || :
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload || :
fi
exit 0
