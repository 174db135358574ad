# The floor for the 0.34.0 replay: Ubuntu 24.04's packages as a GPU host has them installed
# (scripts/gpu/floor_rootfs.py), then what the release's Dockerfile does after its apt-get install
# (docker/Dockerfile:782-787): python3 as the alternative for python3.12, python3-config, no EXTERNALLY-MANAGED,
# pip installed the way get-pip.py installs it (into /usr/local/lib/python3.12/dist-packages), the linker's cache.
FROM localhost/floor-rootfs:noble
ARG PIP_WHEEL
COPY ${PIP_WHEEL} /tmp/
RUN ldconfig \
    && update-alternatives --install /usr/bin/python3 python3 /usr/bin/python3.12 1 \
    && update-alternatives --set python3 /usr/bin/python3.12 \
    && ln -sf /usr/bin/python3.12-config /usr/bin/python3-config \
    && rm -f /usr/lib/python3.12/EXTERNALLY-MANAGED \
    && python3.12 /tmp/${PIP_WHEEL}/pip install --no-index --no-cache-dir /tmp/${PIP_WHEEL} \
    && rm /tmp/${PIP_WHEEL} \
    && python3 --version && python3 -m pip --version
