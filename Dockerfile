# The re-planner's image: `recommend` installed from this repository's wheel, run as a non-root user.
# `recommend deploy --format replan-cronjob` names it by default (recommender:latest; --replan-image to change).
# Build: docker build -t recommender:latest .   (docs/docker.md)

# ---- build the wheel (setup.py copies catalogs/ and policies/ into it) ----
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY recommender ./recommender
COPY catalogs ./catalogs
COPY policies ./policies
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# ---- runtime: the wheel and its dependencies only ----
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# uid/gid 1000: the CronJob's pod sets fsGroup 1000, so the user can write the history volume (/data)
RUN groupadd --gid 1000 recommender \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin recommender
COPY --from=build /dist/ /tmp/dist/
RUN python -m pip install --no-cache-dir /tmp/dist/recommender-*.whl && rm -rf /tmp/dist
USER 1000:1000
WORKDIR /home/recommender
ENTRYPOINT ["recommend"]
CMD ["--help"]
