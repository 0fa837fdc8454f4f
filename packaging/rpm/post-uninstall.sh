# shim-agent %postun (packaging/rpm/README.md). $1: 0 on erase, 1 or more on upgrade.
# The state (/var/lib/shim-agent), the shims (/opt/shim-agent) and a changed config
# (saved as config.toml.rpmsave) always stay: rpm has no purge.
# Erase: the directories %post made go too when they are empty (a Shim file of the admin's stays).
if [ "$1" -eq 0 ]; then
    rmdir /etc/shim-agent/shims.d /etc/shim-agent 2>/dev/null || :
fi
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload || :
    # Upgrade: restart the agent (now the new binary) only if it was running.
    if [ "$1" -ge 1 ]; then
        systemctl try-restart shim-agent.service || :
    fi
fi
exit 0
