# The controller image: a release build without the test machinery (the
# default features leave out rewind::testenv; --no-default-features says so
# even if the defaults change), on a distroless base that runs as the
# non-root user 65532.
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --no-default-features --bin rewind

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/rewind /usr/local/bin/rewind
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/rewind"]
CMD ["controller"]
