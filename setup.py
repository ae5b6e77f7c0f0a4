from setuptools import find_packages, setup


def read_version() -> str:
    namespace: dict = {}
    with open('kcla_mm/version.py', encoding='utf-8') as f:
        exec(f.read(), namespace)
    return namespace['__version__']


setup(
    name='kcla_mm',
    version=read_version(),
    description='Key-Correlated Layer Attention (KCLA) backbones for '
    'MMDetection and MMSegmentation',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['kcla_mm', 'kcla_mm.*']),
    python_requires='>=3.11',
    install_requires=[
        'torch==2.13.0',
        'setuptools>=77,<82',
        'mmengine==0.10.7',
        'mmcv==2.1.0',
        'mmdet==3.3.0',
        'mmsegmentation==1.2.2',
        'ftfy',
        'regex',
        'pycocotools',
        'numpy<2',
    ],
    extras_require={'tests': ['pytest']},
    license='Apache-2.0',
    zip_safe=False,
)
