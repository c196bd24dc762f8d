#!/bin/bash
# Entry point of the mgpu-launch worker image (docker/Dockerfile).
#
#   entrypoint.sh keygen          create the simulated cluster's keys in $MGPU_KEYS_DIR once:
#                                 the user's key pair, one host key shared by the simulated
#                                 hosts, and a known_hosts line naming them ($MGPU_HOSTS)
#   entrypoint.sh sshd [--check]  install those keys for $MGPU_USER and run sshd in the
#                                 foreground (the default); --check writes the config, tests
#                                 it with `sshd -t` and prints the command instead of running it
#   entrypoint.sh CMD [ARGS...]   run any other command (e.g. bash, mgpu-launch ...)
#
# Every path is an environment variable, so the script also runs outside a container
# (the project's tests run it against temporary directories, as an unprivileged setup).
set -euo pipefail

KEYS_DIR=${MGPU_KEYS_DIR:-/keys}
SSHD_DIR=${MGPU_SSHD_DIR:-/etc/ssh/mgpu}
SSH_USER=${MGPU_USER:-mgpu}
HOSTS=${MGPU_HOSTS:-node1,node2,node3}
PORT=${MGPU_SSH_PORT:-22}
LISTEN=${MGPU_LISTEN:-0.0.0.0}
SSHD=${MGPU_SSHD:-/usr/sbin/sshd}
# sshd refuses key files under group/world-writable directories (StrictModes); keep the
# default `yes` in the image, where everything lives under /etc and the user's home.
STRICT_MODES=${MGPU_SSHD_STRICT_MODES:-yes}

log() { echo "mgpu-entrypoint: $*" >&2; }

user_home() {
    if [ -n "${MGPU_USER_HOME:-}" ]; then
        echo "$MGPU_USER_HOME"
    else
        getent passwd "$SSH_USER" | cut -d: -f6
    fi
}

keygen() {
    umask 077
    mkdir -p "$KEYS_DIR"
    if [ ! -f "$KEYS_DIR/id_ed25519" ]; then
        ssh-keygen -q -t ed25519 -N "" -C "mgpu-launch-user" -f "$KEYS_DIR/id_ed25519"
        log "created the user key $KEYS_DIR/id_ed25519"
    fi
    if [ ! -f "$KEYS_DIR/ssh_host_ed25519_key" ]; then
        ssh-keygen -q -t ed25519 -N "" -C "mgpu-launch-simulated-host" \
            -f "$KEYS_DIR/ssh_host_ed25519_key"
        log "created the host key $KEYS_DIR/ssh_host_ed25519_key"
    fi
    # One line naming every simulated host, so `host_key_policy: strict` works as is.
    local names=$HOSTS
    if [ "$PORT" != 22 ]; then
        names=$(echo "$HOSTS" | tr ',' '\n' | sed "s/.*/[&]:$PORT/" | paste -sd, -)
    fi
    echo "$names $(cut -d' ' -f1,2 "$KEYS_DIR/ssh_host_ed25519_key.pub")" \
        > "$KEYS_DIR/known_hosts"
    chmod 644 "$KEYS_DIR"/*.pub "$KEYS_DIR/known_hosts"
    log "known_hosts for $HOSTS written to $KEYS_DIR/known_hosts"
}

install_keys() {
    local home
    home=$(user_home)
    if [ -z "$home" ]; then
        log "no user $SSH_USER (set MGPU_USER or MGPU_USER_HOME)"
        exit 2
    fi
    for file in id_ed25519 id_ed25519.pub ssh_host_ed25519_key known_hosts; do
        if [ ! -f "$KEYS_DIR/$file" ]; then
            log "missing $KEYS_DIR/$file: run \`entrypoint.sh keygen\` first (the compose file's keygen service does)"
            exit 2
        fi
    done
    umask 077
    mkdir -p "$SSHD_DIR" "$home/.ssh"
    # sshd reads authorized_keys as the user logging in: the directory (made under
    # umask 077) must let them in; the host key inside stays private (600).
    chmod 755 "$SSHD_DIR"
    # sshd wants its host key private to the user running it.
    install -m 600 "$KEYS_DIR/ssh_host_ed25519_key" "$SSHD_DIR/ssh_host_ed25519_key"
    install -m 644 "$KEYS_DIR/id_ed25519.pub" "$SSHD_DIR/authorized_keys"
    # The user's side: the key to reach the other hosts and their known host key.
    install -m 600 "$KEYS_DIR/id_ed25519" "$home/.ssh/id_ed25519"
    install -m 644 "$KEYS_DIR/known_hosts" "$home/.ssh/known_hosts"
    if [ "$(id -u)" = 0 ] && id "$SSH_USER" >/dev/null 2>&1; then
        chown -R "$SSH_USER": "$home/.ssh"
    fi
    cat > "$SSHD_DIR/sshd_config" <<EOF
# sshd of a simulated mgpu-launch host (docker/entrypoint.sh)
ListenAddress $LISTEN:$PORT
HostKey $SSHD_DIR/ssh_host_ed25519_key
PidFile none
AuthorizedKeysFile $SSHD_DIR/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes $STRICT_MODES
UsePAM no
# The launcher uploads its agent over SFTP.
Subsystem sftp internal-sftp
# A whole cluster may connect at once.
MaxStartups 100:30:200
PrintMotd no
EOF
    chmod 644 "$SSHD_DIR/sshd_config"
}

run_sshd() {
    local check=${1:-}
    install_keys
    # Privilege separation needs this directory (the image's /run is empty at start).
    if [ ! -d /run/sshd ] && [ "$(id -u)" = 0 ] && [ "$check" != --check ]; then
        mkdir -p /run/sshd
    fi
    "$SSHD" -t -f "$SSHD_DIR/sshd_config"
    if [ "$check" = --check ]; then
        echo "config ok: $SSHD -D -e -f $SSHD_DIR/sshd_config (user $SSH_USER, $LISTEN:$PORT)"
        return 0
    fi
    log "sshd listening on $LISTEN:$PORT for $SSH_USER"
    exec "$SSHD" -D -e -f "$SSHD_DIR/sshd_config"
}

case "${1:-sshd}" in
    keygen) keygen ;;
    sshd) run_sshd "${2:-}" ;;
    *) exec "$@" ;;
esac
