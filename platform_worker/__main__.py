"""`python -m platform_worker`: starts instances on the platform as the controller asks."""

from platform_worker.worker import PlatformWorker
from scaler import runtime


def main() -> None:
    p = runtime.parser("python -m platform_worker", __doc__)
    p.add_argument("--platform", default=runtime.env("PLATFORM", "127.0.0.1:50051"), help="[SCALER_PLATFORM]")
    p.add_argument(
        "--concurrency",
        type=int,
        default=int(runtime.env("CONCURRENCY", "1024")),
        help="platform calls in flight at most [SCALER_CONCURRENCY]",
    )
    args = p.parse_args()
    runtime.main(lambda a: PlatformWorker(a.nats, a.platform, a.concurrency), args)


if __name__ == "__main__":
    main()
