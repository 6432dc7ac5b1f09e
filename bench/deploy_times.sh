#!/usr/bin/env bash
# Deploy figures: artefact sizes, build times, and install times in a real systemd container.
#   sudo bench/deploy_times.sh        (root: boots systemd in namespaces; ~3 min)
set -euo pipefail
cd "$(dirname "$0")/.."
ns=tests/integration/systemd/sysd-ns
name=bench-deploy-$$
t() {  # seconds the command took; FAILED if it failed
  local s=$EPOCHREALTIME
  "$@" >/dev/null 2>&1 || { echo FAILED; return; }
  printf '%.1f' "$(bc <<<"$EPOCHREALTIME - $s")"
}
trap '"$ns" down "$name" >/dev/null 2>&1 || true' EXIT

echo "build-deb.sh (dependency wheels cached): $(t packaging/build-deb.sh) s"
deb=$(ls build/ingero_*_amd64.deb | tail -1)
tar=$(ls build/ingero-wheelhouse-*.tar | tail -1)
echo "wheelhouse: $(ls build/wheelhouse/*.whl | wc -l) wheels, $(du -m "$tar" | cut -f1) MiB archive"
echo ".deb: $(du -m "$deb" | cut -f1) MiB, installed $(dpkg-deb -f "$deb" Installed-Size | awk '{printf "%d", $1/1024}') MiB"
echo "container boot (systemd as PID 1): $(t "$ns" up "$name" --net) s"
echo "dpkg -i: $(t "$ns" exec "$name" dpkg -i "$PWD/$deb") s"
echo "dpkg --purge: $(t "$ns" exec "$name" dpkg --purge ingero) s"
"$ns" down "$name" >/dev/null 2>&1
"$ns" up "$name" --net >/dev/null 2>&1
inv=$(mktemp); trap 'rm -f "$inv"; "$ns" down "$name" >/dev/null 2>&1 || true' EXIT
printf '[gpu_nodes]\nlocalhost ansible_connection=local\n[fleet_host]\nlocalhost ansible_connection=local\n' > "$inv"
play() {
  "$ns" exec "$name" env ANSIBLE_CONFIG="$PWD/ansible/ansible.cfg" "$PWD/.venv/bin/ansible-playbook" \
    -i "$inv" "$PWD/ansible/site.yml" -e ingero_wheelhouse="$PWD/$tar" "$@"
}
echo "ansible-playbook, fresh host, --check: $(t play --check) s"
echo "ansible-playbook, fresh host: $(t play) s"
echo "ansible-playbook, second run (changed=0): $(t play) s"
