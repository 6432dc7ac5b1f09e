#!/usr/bin/env bash
# Build the ingero Debian package from a staged tree with dpkg-deb.
#   packaging/build-deb.sh [OUTDIR]          (default build/; prints the .deb path)
# The package carries a ready venv in /opt/ingero/venv, built from the wheelhouse
# (packaging/build-wheelhouse.sh) with Debian's python3.11, so it installs offline and its
# dependencies are exactly the wheels that were tested. The venv is created at its final
# path inside a private mount namespace, so scripts' #! lines are right and the build host's
# /opt is never touched. Needs root, or unprivileged user namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=$(realpath -m "${1:-build}")
py=/usr/bin/python3.11
wheelhouse=$out/wheelhouse
wheel=$(packaging/build-wheelhouse.sh "$wheelhouse" | tail -1)
version=$(basename "$wheel" | cut -d- -f2)
arch=$(dpkg --print-architecture)
stage=$out/deb/ingero_${version}_${arch}
rm -rf "$stage"
mkdir -p "$stage/opt/ingero" "$stage/DEBIAN"

# the venv, at /opt/ingero/venv as seen from inside a private mount namespace
ns=(unshare --mount --propagation private)
[[ $(id -u) == 0 ]] || ns=(unshare --map-root-user --mount --propagation private)
"${ns[@]}" bash -euc '
  mount -t tmpfs ingero-build /opt
  mkdir /opt/ingero
  mount --bind "$1/opt/ingero" /opt/ingero
  "$2" -m venv /opt/ingero/venv
  /opt/ingero/venv/bin/pip install --quiet --disable-pip-version-check --no-index \
    --find-links "$3" ingero
' _ "$stage" "$py" "$wheelhouse"

install -d "$stage/usr/bin"
ln -s /opt/ingero/venv/bin/ingero "$stage/usr/bin/ingero"
install -D -m 644 -t "$stage/lib/systemd/system" systemd/*.service
install -D -m 644 systemd/tmpfiles.d/ingero.conf "$stage/usr/lib/tmpfiles.d/ingero.conf"
install -D -m 644 systemd/sysusers.d/ingero.conf "$stage/usr/lib/sysusers.d/ingero.conf"
install -D -m 755 -t "$stage/usr/lib/ingero/slurm" slurm/prolog slurm/epilog slurm/taskprolog slurm/ingero-hook
install -D -m 644 -t "$stage/usr/share/ingero/slurm" slurm/slurm.conf.snippet slurm/ingero-slurm.env.example
install -D -m 644 -t "$stage/usr/share/ingero/bpf" bpf/*.c
doc=$stage/usr/share/doc/ingero
install -D -m 644 -t "$doc" packaging/README.md
for f in docs/operations.md docs/install.md; do [[ -f $f ]] && install -m 644 "$f" "$doc/"; done
for d in systemd/examples/*.service.d; do
  install -D -m 644 -t "$doc/examples/$(basename "$d")" "$d"/*.conf
done
# configuration files: every key optional, the defaults documented in each daemon's docs
install -d "$stage/etc/ingero"
for daemon in fleet echo fleet-push; do
  printf '# ingero %s configuration; every key is optional (see the docs for the defaults).\n{}\n' \
    "$daemon" > "$stage/etc/ingero/$daemon.yaml"
  chmod 644 "$stage/etc/ingero/$daemon.yaml"
  echo "/etc/ingero/$daemon.yaml" >> "$stage/DEBIAN/conffiles"
done

sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" packaging/debian/control.in > "$stage/DEBIAN/control"
echo "Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)" >> "$stage/DEBIAN/control"
install -m 755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"

deb=$out/ingero_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz -z1 --build "$stage" "$deb" >/dev/null
echo "$deb"
