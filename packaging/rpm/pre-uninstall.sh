# shim-agent %preun (packaging/rpm/README.md). $1: 0 on erase, 1 or more on upgrade.
# Erase: stop the agent on a live host and drop the enablement links (rpm has no purge; no
# systemctl without a running systemd). Upgrade: leave it running; %postun try-restarts it.
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl stop shim-agent.service || :
    fi
    rm -f /etc/systemd/system/*.wants/shim-agent.service || :
fi
exit 0
