#!/usr/bin/env bash
# What the tests need outside Python: Debian's Chromium, nginx, OpenLDAP's slapd and headers, Node's clients
# (tests/node, from its lock file), and PostgreSQL and Redis running.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ! -x /usr/bin/chromium ]; then
  echo "tests/prepare.sh: installing Debian's chromium"
  apt_install chromium
fi

# nginx only runs the repo's deploy/nginx/chat.conf in tests/deploy/test_deploy.py (never as a service);
# without it those tests are skipped with a reason, so a failed install does not stop the rest.
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  echo "tests/prepare.sh: installing nginx"
  apt_install nginx || echo "tests/prepare.sh: nginx could not be installed; tests/deploy/test_deploy.py will be skipped" >&2
fi

# LDAP: python-ldap (requirements-ldap.txt) is built against libldap2-dev and libsasl2-dev;
# tests/auth/test_ldap.py runs its own slapd (own data directory and port), never the packaged service.
if [ ! -x /usr/sbin/slapd ] || ! command -v ldapwhoami >/dev/null || [ ! -f /usr/include/ldap.h ] \
  || [ ! -f /usr/include/sasl/sasl.h ] || ! command -v gcc >/dev/null; then
  echo "tests/prepare.sh: installing slapd, ldap-utils and the headers python-ldap builds against"
  apt_install slapd ldap-utils libldap2-dev libsasl2-dev gcc
fi

# GNU gettext: tests/views/test_i18n.py runs makemessages (xgettext) to check the catalogues are complete.
if ! command -v xgettext >/dev/null || ! command -v msgfmt >/dev/null; then
  echo "tests/prepare.sh: installing gettext"
  apt_install gettext
fi

# Node's API clients (openai, the AI SDK) for tests/views/test_node_clients.py, exactly as tests/node/package-lock.json
# pins them (integrity hashes checked by npm ci); reinstalled only when the lock file changes.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "tests/prepare.sh: installing Node.js and npm"
  apt_install nodejs npm
fi
node_dir="$(dirname "$0")/node"
if [ ! -f "$node_dir/node_modules/.installed" ] || [ "$node_dir/package-lock.json" -nt "$node_dir/node_modules/.installed" ]; then
  echo "tests/prepare.sh: installing tests/node's packages (npm ci)"
  (cd "$node_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error && touch node_modules/.installed)
fi

if ! command -v pg_ctlcluster >/dev/null; then
  echo "tests/prepare.sh: installing PostgreSQL"
  apt_install postgresql
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "tests/prepare.sh: starting PostgreSQL"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | tail -n 1)" main start
fi

if ! command -v redis-server >/dev/null; then
  echo "tests/prepare.sh: installing Redis"
  apt_install redis-server
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "tests/prepare.sh: starting Redis"
  as_root redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi

for _ in $(seq 50); do
  if pg_isready -q -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    exit 0
  fi
  sleep 0.2
done
echo "tests/prepare.sh: PostgreSQL or Redis did not come up" >&2
exit 1
